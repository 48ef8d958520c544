"""The sweep layer: case files, the run store and the executors that run a case."""
