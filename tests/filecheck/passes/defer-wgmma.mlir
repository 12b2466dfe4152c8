// RUN: tkc opt %s -p insert-tma-pipeline,defer-wgmma | filecheck %s

// Each step issues its scores, then the previous step's P·V (P carried in bf16, V from the previous step's stage:
// step k - 1's, or k's own at step 0 where P is zero); waits for the scores only (1 group may run on), runs the
// softmax, waits for P·V before the stage is released; the last P·V runs after the loop if it ran.

// CHECK-LABEL: func.func @attention_steps(
// CHECK:         %[[P0:.*]] = tile.fill 0.0 : !tile.rt<16x64xbf16>
// CHECK:         scf.for %j = %c0 to %n step %c1 iter_args(%o = %z, %[[P:.*]] = %[[P0]])
// CHECK:           tile.stage_wait %{{.*}}[%[[K:.*]]]
// CHECK:           %s = tile.wgmma_ABt %q, %ks, %z {tkc.deferred}
// CHECK:           %[[HAS:.*]] = arith.cmpi sgt, %[[K]]
// CHECK-NEXT:      %[[BACK:.*]] = arith.subi %[[K]]
// CHECK-NEXT:      %[[PREV:.*]] = arith.select %[[HAS]], %[[BACK]], %[[K]]
// CHECK-NEXT:      %[[STAGE:.*]] = arith.remui %[[PREV]]
// CHECK-NEXT:      %[[V:.*]] = tile.ring_read %{{.*}}[%[[STAGE]]]
// CHECK-NEXT:      %o2 = tile.wgmma_AB %[[P]], %[[V]], %o {tkc.deferred}
// CHECK-NEXT:      tile.wgmma_wait 1
// CHECK-NEXT:      %e = tile.exp2 %s
// CHECK:           tile.wgmma_wait 0
// CHECK-NEXT:      scf.if
// CHECK-NEXT:        tile.stage_release
// CHECK:           %p = tile.convert %e
// CHECK-NEXT:      scf.yield %o2, %p
// CHECK:         scf.if %{{.*}} -> (!tile.rt<16x64xf32>) {
// CHECK:           tile.wgmma_AB
// CHECK-NOT:       tkc.deferred
builtin.module attributes {tkc.target = "sm_90a"} {
  func.func @attention_steps(%q: !tile.st<64x64xbf16>, %k: !tile.gl<?x?xbf16>, %v: !tile.gl<?x?xbf16>, %n: i32,
                             %c0: i32) attributes {tkc.defer, tkc.warps = 4 : i64} {
    %c1 = arith.constant 1 : i32
    %z = tile.fill 0.0 : !tile.rt<16x64xf32>
    %r = scf.for %j = %c0 to %n step %c1 iter_args(%o = %z) -> (!tile.rt<16x64xf32>) : i32 {
      %ks = tile.load %k[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
      %vs = tile.load %v[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
      %s = tile.wgmma_ABt %q, %ks, %z : !tile.st<64x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
      %e = tile.exp2 %s : !tile.rt<16x64xf32>
      %p = tile.convert %e : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
      %o2 = tile.wgmma_AB %p, %vs, %o : !tile.rt<16x64xbf16>, !tile.st<64x64xbf16>, !tile.rt<16x64xf32>
      scf.yield %o2 : !tile.rt<16x64xf32>
    }
    func.return
  }
}
