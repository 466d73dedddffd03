"""A package only the fake gateway venv has on its path."""

WHERE = "the gateway venv"
