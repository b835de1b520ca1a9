/* opcodes.h: the VM's one opcode table. X(name, nsrc) generates the instruction enum (vm.h), the dispatch names and
   the Python opcode map (pg_vm_opcode_name). Values are positions in the table; Python reads them by name.
   ABS is not an IR op: the planner lowers x * sign(x) (mathops' abs) to it, with that product's exact results.
   DIV is not an IR op either: a float MUL(a, RECIPROCAL(b)) runs as it, the correctly rounded quotient a / b (as
   numpy's, torch's and JAX's division), like a compiler contracting a multiply-add into an FMA. */
#ifndef PG_OPCODES_H
#define PG_OPCODES_H

#define PG_VM_OPCODES(X) \
  X(MOV, 1) X(RECIPROCAL, 1) X(SQRT, 1) X(SIN, 1) X(LOG2, 1) X(EXP2, 1) X(TRUNC, 1) X(CAST, 1) X(BITCAST, 1) X(ABS, 1) \
  X(ADD, 2) X(MUL, 2) X(DIV, 2) X(MAX, 2) X(POW, 2) X(IDIV, 2) X(MOD, 2) X(AND, 2) X(OR, 2) X(XOR, 2) X(SHL, 2) X(SHR, 2) \
  X(CMPLT, 2) X(CMPNE, 2) X(CMPEQ, 2) X(WHERE, 3)

#define PG_VM_ENUM_ENTRY(name, nsrc) VM_##name,
enum pg_vm_opcode { PG_VM_OPCODES(PG_VM_ENUM_ENTRY) VM_NOPCODES };
#undef PG_VM_ENUM_ENTRY

#endif
