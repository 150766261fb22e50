"""Container environments from Environment Definition Files (CSCS's TOML format): parse
and resolve, render to a runtime's exact launch, run, check."""
