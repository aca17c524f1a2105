"""Stand-in that hides torch: the stand-in GPU has none, on any machine."""
raise ImportError("torch hidden by the stand-in GPU")
