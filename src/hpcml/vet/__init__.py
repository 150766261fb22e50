"""Node vetting and early abort: protocol -> checks on every node -> verdict -> exclude list."""
