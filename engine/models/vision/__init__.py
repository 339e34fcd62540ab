"""Vision towers of the vision-language families, with the checkpoints' parameter names under `visual.`."""
