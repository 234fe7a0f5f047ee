# fragment for engines/llama (filled in by its engine)
