"""GPU samplers for ``hpcml score record``: DCGM profiling fields, NVML as the fallback."""
