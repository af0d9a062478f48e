"""The built-in launchers: ``local`` (child processes) and ``ray`` (actors on a cluster)."""
