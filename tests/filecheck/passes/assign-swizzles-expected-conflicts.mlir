// RUN: tkc opt %s -p assign-layouts,assign-swizzles --werror | filecheck %s
// RUN: sed 's/tile.conflicts = 2/tile.conflicts = 1/' %s | not tkc opt - -p assign-layouts,assign-swizzles --werror 2>&1 | filecheck %s --check-prefix=ERROR

// A store its author marked with the conflicts it is known to have (`store(..., conflicts=2)` in the DSL) is not
// reported; marked with fewer than it has, it still is.

// CHECK: tile.insert {{.*}} {tile.conflicts = 2 : i64}
// ERROR: error: this store into shared memory has a 2-way shared memory bank conflict
func.func @expected(%t: !tile.rt<16x16xf32>, %s: !tile.st<16x16xf32>, %b: !tile.rt<16x16xbf16>, %c0: i32) {
  %tt = tile.transpose %t : !tile.rt<16x16xf32> -> !tile.rt<16x16xf32>
  %s2 = tile.insert %tt, %s[%c0, %c0] {tile.conflicts = 2 : i64} : !tile.rt<16x16xf32> -> !tile.st<16x16xf32>
  %bt = tile.convert %t : !tile.rt<16x16xf32> -> !tile.rt<16x16xbf16>
  %x = tile.mma_AB %bt, %b, %t : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
  func.return
}
