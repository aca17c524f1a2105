"""Records, artifacts, configuration and the command line: what every stage shares."""
