"""What jobctl keeps: the sqlite history (the only SQL) and the job folder's layout."""
