"""Studies over models x settings x optimizations: a sweep file expands into cells, each cell is
one ``diffmeter bench`` run folder, run in its own process, locally or on a Ray cluster."""
