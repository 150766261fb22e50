"""One module per sampler. A sampler's ``sample(ts_ns)`` returns store rows."""
