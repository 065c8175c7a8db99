"""In-job monitoring: GPU sampling, failure classification, outcome records."""
