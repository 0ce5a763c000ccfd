"""DeepSeek V4 and V4.1 cache records as vLLM writes them (``dsv4:<record>``): the arithmetic, rows and pages
per vLLM version (:mod:`.records`) and the family that parses and checks them (:mod:`.family`)."""
