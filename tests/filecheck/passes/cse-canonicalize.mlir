// RUN: tkc opt %s -p cse,canonicalize | filecheck %s

// The cleanup pipeline over loops: cse merges the repeated warp_id (inside the loop too), canonicalize folds a
// loop that runs zero times into its initial value and drops the ops that only fed it.

// CHECK-LABEL: func.func @loop(
// CHECK:         %w = tile.warp_id
// CHECK-NEXT:    %acc = tile.fill 0.0 : !tile.rt<16x16xf32>
// CHECK-NEXT:    %r = scf.for %k = %c0 to %n step %c1 iter_args(%acc_1 = %acc) -> (!tile.rt<16x16xf32>) : i32 {
// CHECK-NEXT:      %a = tile.load %g[%w, %k] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xbf16>
// CHECK-NEXT:      %b = tile.load %g[%k, %w] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xbf16>
// CHECK-NEXT:      %acc_2 = tile.mma_AB %a, %b, %acc_1 : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
// CHECK-NEXT:      scf.yield %acc_2 : !tile.rt<16x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %sum = tile.add %r, %acc : !tile.rt<16x16xf32>
// CHECK-NEXT:    tile.store %sum, %o[%w, %w] : !tile.rt<16x16xf32> -> !tile.gl<?x?xf32>
// CHECK-NEXT:    func.return
func.func @loop(%g: !tile.gl<?x?xbf16>, %o: !tile.gl<?x?xf32>, %n: i32) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %w = tile.warp_id
  %acc = tile.fill 0.0 : !tile.rt<16x16xf32>
  %r = scf.for %k = %c0 to %n step %c1 iter_args(%acc_1 = %acc) -> (!tile.rt<16x16xf32>) : i32 {
    %w2 = tile.warp_id
    %a = tile.load %g[%w, %k] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xbf16>
    %b = tile.load %g[%k, %w2] : !tile.gl<?x?xbf16> -> !tile.rt<16x16xbf16>
    %acc_2 = tile.mma_AB %a, %b, %acc_1 : !tile.rt<16x16xbf16>, !tile.rt<16x16xbf16>, !tile.rt<16x16xf32>
    scf.yield %acc_2 : !tile.rt<16x16xf32>
  }
  %scale = tile.fill 2.0 : !tile.rt<16x16xf32>
  %never = scf.for %k = %c1 to %c0 step %c1 iter_args(%x = %acc) -> (!tile.rt<16x16xf32>) : i32 {
    %y = tile.mul %x, %scale : !tile.rt<16x16xf32>
    scf.yield %y : !tile.rt<16x16xf32>
  }
  %sum = tile.add %r, %never : !tile.rt<16x16xf32>
  tile.store %sum, %o[%w, %w] : !tile.rt<16x16xf32> -> !tile.gl<?x?xf32>
  func.return
}
