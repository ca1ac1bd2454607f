"""Pure rules of Stasis: no I/O, no SDK imports, time is passed in."""
