"""Loading what a run decodes with: the target model and its tokenizer (models.py), the embedded SmolLM2 (embedded.py), and which draft head a model uses (resolve.py)."""
