"""One bug a module, each beside the case file that trains it (``<bug>.toml``); the zoo
(``python -m stability zoo``) finds them by their case files."""
