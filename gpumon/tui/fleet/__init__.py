"""The TUI over many hosts: the app, the overview and its rows, a host's view, acting on a host."""
