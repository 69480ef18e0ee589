"""Talking to a chat model: one answer drawn (reply), the terminal (cli), the OpenAI endpoint
(server)."""
