"""vet at fleet scale: the results collector (``hpcml vet serve``), rules and the node handler."""
