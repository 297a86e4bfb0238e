"""What a run found, typed (results), turned into rows and the report (rows), and what could be checked (coverage)."""
