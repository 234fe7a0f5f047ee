# fragment for engines/common (filled in by its engine)
