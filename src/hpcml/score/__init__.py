"""GPU saturation scorer: DCGM profiling fields -> compute / memory / interconnect score."""
