"""What Tideshift decided and did, read back for operators: `tideshift explain` (one target's
decisions over time, from the TIDESHIFT_HISTORY stream) and `tideshift status` (the current
picture, from the latest plan, results and the watcher's snapshot). `history.py` and
`picture.py` are pure (time is an argument); `cli.py` reads the bus and prints."""
