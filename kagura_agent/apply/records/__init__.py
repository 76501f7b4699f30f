"""Records: what a run shows and keeps (the live view, its journal, the runs table with the
apply lock and the dead-run sweep, incidents, the record of the result)."""
