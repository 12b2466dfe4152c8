// RUN: tkc opt %s -p pingpong-warpgroups | filecheck %s

// Two warpgroups take turns at the tensor cores: warpgroup 1 passes before the loop, a wait before and a pass
// after each wgmma, the first wait and the last pass only at the first and the last step (the last wgmma of a
// step and the first of the next share a turn), and warpgroup 0 takes the turn left after the loop.

// CHECK-LABEL: func.func @turns(
// CHECK:         %[[WG:.*]] = tile.warpgroup_id
// CHECK:         scf.if
// CHECK-NEXT:      tile.turn_pass
// CHECK:         scf.for %j
// CHECK:           %[[FIRST:.*]] = arith.cmpi eq, %j, %c0
// CHECK-NEXT:      scf.if %[[FIRST]] {
// CHECK-NEXT:        tile.turn_wait
// CHECK:           tile.wgmma_ABt
// CHECK-NEXT:      tile.turn_pass
// CHECK-NEXT:      %p = tile.convert
// CHECK-NEXT:      tile.turn_wait
// CHECK-NEXT:      %o2 = tile.wgmma_AB
// CHECK-NEXT:      %[[NEXT:.*]] = arith.addi %j, %c1
// CHECK-NEXT:      %[[LAST:.*]] = arith.cmpi sge, %[[NEXT]], %n
// CHECK-NEXT:      scf.if %[[LAST]] {
// CHECK-NEXT:        tile.turn_pass
// CHECK:         tile.warpgroup_id
// CHECK:         scf.if
// CHECK-NEXT:      tile.turn_wait
func.func @turns(%q: !tile.st<64x64xbf16>, %k: !tile.st<64x64xbf16>, %v: !tile.st<64x64xbf16>, %n: i32,
                 %c0: i32, %c1: i32) attributes {tkc.pingpong, tkc.warps = 8 : i64} {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%o = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %s = tile.wgmma_ABt %q, %k, %z : !tile.st<64x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
    %p = tile.convert %s : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
    %o2 = tile.wgmma_AB %p, %v, %o : !tile.rt<16x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
    scf.yield %o2 : !tile.rt<16x64xf32>
  }
  func.return
}
