"""The daemon as a service: its settings and how it is run."""
