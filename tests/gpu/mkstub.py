#!/usr/bin/env python3
"""Writes an assembly file that defines every symbol of a symbol table (lines "TYPE BIND SIZE NAME" from readelf
--dyn-syms of a real library: FUNC/IFUNC as a one-instruction function, OBJECT/TLS as zeroed storage of the same
size, GLOBAL/WEAK/UNIQUE binding kept). Linked as a shared library with the real SONAME, it lets the linker resolve
and size every reference (copy relocations included) exactly as against the real library, which the program then
loads at run time (docs/cuda.md, "Running on the GPU machine"). Nothing here ever runs.

usage: mkstub.py SYMBOLS.txt OUT.s"""
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    text, data, tls = [".text"], [".data"], ['.section .tbss,"awT",@nobits']
    with open(sys.argv[1]) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            typ, bind, size_text, name = parts
            size = int(size_text, 0)
            vis = ".weak" if bind == "WEAK" else ".globl"
            if typ in ("FUNC", "IFUNC"):
                text += [f"{vis} {name}", f".type {name},@function", f"{name}:", "ret"]
            elif typ == "TLS":
                tls += [f"{vis} {name}", f".type {name},@tls_object", f".size {name},{size}", f"{name}:",
                        f".zero {max(size, 1)}"]
            elif typ == "OBJECT":
                kind = "@gnu_unique_object" if bind == "UNIQUE" else "@object"
                data += [f"{vis} {name}", f".type {name},{kind}", f".size {name},{size}", ".balign 16", f"{name}:",
                         f".zero {max(size, 1)}"]
            else:  # NOTYPE
                data += [f"{vis} {name}", f"{name}:", ".zero 8"]
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(text + data + tls) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
