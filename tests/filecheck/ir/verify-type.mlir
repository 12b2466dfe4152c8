// RUN: not tkc opt %s 2>&1 | filecheck %s

// A bad type is a parse error that points at the type (not an internal error).

// CHECK-NOT: internal error
// CHECK: verify-type.mlir:[[# @LINE + 3]]:
// CHECK: rt dimensions must be positive multiples of 16, got 16x8
func.func @bad_type() {
  %t = tile.fill 0.0 : !tile.rt<16x8xf32>
  func.return
}
