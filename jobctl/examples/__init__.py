"""Small training programs that ship with jobctl (the embedded default's job)."""
