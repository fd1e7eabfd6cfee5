"""`python -m project serve`: the trained classifier behind an HTTP endpoint (LitServe, dynamic batching)."""

#: The commands this part adds (project.find_tools reads this literal without importing the package): name ->
#: (".module:function" relative to this package, summary).
COMMANDS = {"serve": (".server:main", "HTTP prediction endpoint (LitServe)")}
