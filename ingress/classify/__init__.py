"""A classifier's routes (`*ForSequenceClassification`, reward models): vLLM's POST /classify and POST /pooling,
SGLang's POST /classify, told apart by their fields."""
