"""verl 0.9.1: SAM's replica and server, per-step metrics in verl's logs, and the recipe launcher."""
