// RUN: tkc opt %s -p assign-layouts,assign-swizzles 2>&1 >/dev/null | filecheck %s
// RUN: not tkc opt %s -p assign-layouts,assign-swizzles --werror 2>&1 | filecheck %s --check-prefix=ERROR

// An access the swizzle cannot make conflict-free is reported with its line and conflict degree: a warp storing
// an f32 tile in the col layout writes single 4-byte elements that land 8 to a bank.

// CHECK: assign-swizzles-warning.mlir:[[# @LINE + 4]]:{{[0-9]+}}: warning: this store into shared memory has a {{[0-9]+}}-way shared memory bank conflict
// ERROR: assign-swizzles-warning.mlir:[[# @LINE + 3]]:{{[0-9]+}}: error: this store into shared memory has a {{[0-9]+}}-way shared memory bank conflict
func.func @conflict(%t: !tile.rt<16x16xf32>, %s: !tile.st<16x16xf32>, %b: !tile.rt<16x16xbf16>, %c0: i32) {
  %tt = tile.transpose %t : !tile.rt<16x16xf32> -> !tile.rt<16x16xf32>
  %s2 = tile.insert %tt, %s[%c0, %c0] : !tile.rt<16x16xf32> -> !tile.st<16x16xf32>
  %z = tile.fill 0.0 : !tile.rt<16x16xf32>
  %bt = tile.convert %t : !tile.rt<16x16xf32> -> !tile.rt<16x16xbf16>
  %x = tile.mma_AB %bt, %b, %t : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
  func.return
}
