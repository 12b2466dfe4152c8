// RUN: tkc opt %s -p overlap-wgmma | filecheck %s

// The loop's first wgmma (S = Q·Kᵀ) moves a step ahead: step lb's K load and wgmma before the loop, the next
// step's first in the body (its K index is the loop index plus the step), the loop carries the scores.

// CHECK-LABEL: func.func @scores_early(
// CHECK:         %[[K0:.*]] = tile.load %k[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
// CHECK-NEXT:    %[[S0:.*]] = tile.wgmma_ABt %q, %[[K0]], %z
// CHECK-NEXT:    scf.for %j = %c0 to %n step %c1 iter_args(%o = %z, %[[S:.*]] = %[[S0]])
// CHECK-NEXT:      %[[J1:.*]] = arith.addi %j, %c1 : i32
// CHECK-NEXT:      %[[K1:.*]] = tile.load %k[%[[J1]], %c0]
// CHECK-NEXT:      %[[NEXT:.*]] = tile.wgmma_ABt %q, %[[K1]], %z
// CHECK-NEXT:      %p = tile.convert %[[S]]
// CHECK:           scf.yield %o2, %[[NEXT]]
func.func @scores_early(%q: !tile.st<64x64xbf16>, %k: !tile.gl<?x?xbf16>, %v: !tile.st<64x64xbf16>, %n: i32,
                        %c0: i32, %c1: i32) attributes {tkc.overlap, tkc.warps = 4 : i64} {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%o = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %ks = tile.load %k[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %s = tile.wgmma_ABt %q, %ks, %z : !tile.st<64x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
    %p = tile.convert %s : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
    %o2 = tile.wgmma_AB %p, %v, %o : !tile.rt<16x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
    scf.yield %o2 : !tile.rt<16x64xf32>
  }
  func.return
}
