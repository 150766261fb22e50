from hpcml.cli import main

main()
