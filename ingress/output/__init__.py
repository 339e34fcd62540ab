"""What the ingress makes of a worker's answer: its text and stop strings (processor.py over detokenizer.py)."""
