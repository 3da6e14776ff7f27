"""Our engine's ``VT_SPEC_TRACE`` stderr lines into a trace, in the order data flows:
:mod:`.level` (the variable's level rule) -> :mod:`.lines` (one line -> a record) ->
:mod:`.parser` (records -> blocks and phases, with :mod:`.blocks`, :mod:`.requests` and
:mod:`.stats`) -> :mod:`.importer` (a saved log; ``spectrace capture`` parses live through
:mod:`spectrace.hooks.capture`)."""
