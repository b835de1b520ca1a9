"""Bridges between pygrad's IR and foreign IRs, one module per foreign IR (`pygrad.interop.tinygrad`). A foreign
package is imported only by its own module, so `import pygrad.interop` never needs it."""
