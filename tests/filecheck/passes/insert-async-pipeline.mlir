// RUN: tkc opt %s -p insert-async-pipeline{stages=3} | filecheck %s
// RUN: tkc opt %s -p insert-async-pipeline{stages=1} | filecheck %s --check-prefix=SYNC

// A load into shared memory whose index depends only on the loop index becomes a ring of 3 stages: 2 copies start
// before the loop, each guarded by "that iteration runs", each closing a group; every iteration waits until at
// most 1 group is in flight, starts the copy 2 iterations ahead, and reads its stage.

// CHECK-LABEL: func.func @loop(
// CHECK:         %[[RING:.*]] = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
// CHECK:         scf.if
// CHECK:           tile.copy_async %g[%{{.*}}, %c0], %[[RING]][%{{.*}}]
// CHECK:         tile.commit_group
// CHECK:         scf.if
// CHECK:           tile.copy_async
// CHECK:         tile.commit_group
// CHECK:         scf.for
// CHECK:           tile.wait_group 1
// CHECK:           scf.if
// CHECK:             tile.copy_async
// CHECK:           tile.commit_group
// CHECK:           %{{.*}} = tile.ring_read %[[RING]][%{{.*}}] : !tile.ring<3, !tile.st<64x64xbf16>> -> !tile.st<64x64xbf16>
// CHECK-NOT:       tile.load %g

// SYNC-NOT: tile.ring_alloc
// SYNC: tile.load %g
func.func @loop(%g: !tile.gl<?x?xbf16>, %n: i32, %c0: i32) {
  %c1 = arith.constant 1 : i32
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %s = tile.load %g[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %x = tile.load %s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    %a = tile.add %acc, %x : !tile.rt<16x64xf32>
    scf.yield %a : !tile.rt<16x64xf32>
  }
  func.return
}

// An index that depends on a loop-carried value cannot be computed ahead: the load stays synchronous.
// CHECK-LABEL: func.func @dependent(
// CHECK-NOT:     tile.ring_alloc
// CHECK:         tile.load %g[%k, %c0]
func.func @dependent(%g: !tile.gl<?x?xbf16>, %n: i32, %c0: i32) {
  %c1 = arith.constant 1 : i32
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%k = %c0) -> (i32) : i32 {
    %s = tile.load %g[%k, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %k2 = arith.addi %k, %c1 : i32
    scf.yield %k2 : i32
  }
  func.return
}

// A persistent kernel's loop steps by a run-time stride (the grid's size): the trip count and each iteration's
// stage count steps of that stride, and the copy ahead starts at lb + (k + 2) · step.
// CHECK-LABEL: func.func @strided(
// CHECK:         tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
// CHECK:         %[[SPAN:.*]] = arith.subi %n, %b : i32
// CHECK:         %[[TRIPS:.*]] = arith.ceildivsi %[[SPAN]], %step : i32
// CHECK:         scf.for %j = %b to %n step %step
// CHECK:           %[[K:.*]] = arith.divui %{{.*}}, %step : i32
// CHECK:           tile.wait_group 1
// CHECK:           %[[AHEAD:.*]] = arith.addi %[[K]], %{{.*}} : i32
// CHECK:           arith.cmpi slt, %[[AHEAD]], %[[TRIPS]] : i32
// CHECK:             arith.muli %[[AHEAD]], %step : i32
// CHECK:             tile.copy_async
// CHECK:           tile.ring_read
func.func @strided(%g: !tile.gl<?x?xbf16>, %b: i32, %n: i32, %step: i32, %c0: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %b to %n step %step iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %s = tile.load %g[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %x = tile.load %s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    %a = tile.add %acc, %x : !tile.rt<16x64xf32>
    scf.yield %a : !tile.rt<16x64xf32>
  }
  func.return
}

// A load gathering its rows by row numbers (rows_at) is pipelined as any other: its copies keep the index tensor.
// CHECK-LABEL: func.func @gathered(
// CHECK:         tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
// CHECK:           tile.copy_async %g[%r, %{{.*}}] rows_at %p : !tile.gl<?xi32>, %{{.*}}[%{{.*}}] {tile.index_in_rows}
// CHECK:         scf.for
// CHECK:             tile.copy_async %g[%r, %{{.*}}] rows_at %p : !tile.gl<?xi32>, %{{.*}}[%{{.*}}] {tile.index_in_rows}
// CHECK:           tile.ring_read
func.func @gathered(%g: !tile.gl<?x?xbf16>, %p: !tile.gl<?xi32>, %r: i32, %n: i32, %c0: i32) {
  %c1 = arith.constant 1 : i32
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %o = scf.for %k = %c0 to %n step %c1 iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %s = tile.load %g[%r, %k] rows_at %p : !tile.gl<?xi32> {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %x = tile.load %s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    %a = tile.add %acc, %x : !tile.rt<16x64xf32>
    scf.yield %a : !tile.rt<16x64xf32>
  }
  func.return
}
