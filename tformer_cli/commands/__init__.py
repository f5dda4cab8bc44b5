"""The commands of `tformer`, a module each: parse, call one library function, print what it returns.

cli.py holds the table that names them; `options` holds what they share (the option types, standard output).
No command module imports another.
"""
