"""What a failure matches: the catalogues of known departures, one file a pass (forward, backward, decoding)."""
