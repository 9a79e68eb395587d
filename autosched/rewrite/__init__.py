"""The custom rewrite: custom-kernel winners put in place of their ops in the model, with
what each kernel absorbs around its op (see docs/how-it-works.md, "The rewrite")."""
