"""What callqa keeps of a call and how it is removed: erasure on request and by retention."""
