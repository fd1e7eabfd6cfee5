"""`python -m project serve`: the trained classifier behind an HTTP endpoint (LitServe, dynamic batching), with a
page at / to try it in a browser (page.html)."""

#: The commands this part adds (project.find_tools reads this literal without importing the package): name ->
#: (".module:function" relative to this package, summary).
COMMANDS = {"serve": (".server:main", "HTTP prediction endpoint and a page to try it (LitServe)")}
