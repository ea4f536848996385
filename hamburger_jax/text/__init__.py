"""Text: the tokenizer wrapper, chat templates (one owner: chat.py) and GGUF tokenizers."""
