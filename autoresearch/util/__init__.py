"""Helpers every layer may import: files beside the package (paths), secrets (redact),
durations (units), patterns compiled at first use, private files, a grep with a time limit.
They import nothing of autoresearch above them."""
