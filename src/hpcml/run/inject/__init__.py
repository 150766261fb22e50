"""A directory ``hpcml run`` puts first on each rank's PYTHONPATH: its ``sitecustomize``
adds the Flight Recorder dump on request and makes every optimizer step a step
(``hpcml.run.inject.sitecustomize``)."""
