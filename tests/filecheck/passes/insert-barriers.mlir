// RUN: tkc opt %s -p insert-barriers | filecheck %s

// A barrier between a shared write and the reads of it (RAW), and between reads and the next write (WAR); the
// loop body is solved to a fixed point, so the second iteration's write waits for the first one's reads.

// CHECK-LABEL: func.func @raw_war(
// CHECK:         scf.for
// CHECK-NEXT:      tile.barrier
// CHECK-NEXT:      %s = tile.load %g[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
// CHECK-NEXT:      tile.barrier
// CHECK-NEXT:      %x = tile.load %s[%c0, %c0]
// CHECK-NOT:       tile.barrier
// CHECK:           scf.yield
func.func @raw_war(%g: !tile.gl<?x?xbf16>, %n: i32, %c0: i32, %c1: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %s = tile.load %g[%j, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %x = tile.load %s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    %y = tile.load %s[%c1, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    %a = tile.add %acc, %x : !tile.rt<16x64xf32>
    scf.yield %a : !tile.rt<16x64xf32>
  }
  func.return
}

// In a pipelined loop one barrier per iteration does both jobs: after the wait (the stage landed for everyone)
// and before the next copy (everyone finished reading the stage it overwrites).
// CHECK-LABEL: func.func @pipelined(
// CHECK:         scf.for
// CHECK-NEXT:      tile.wait_group 1
// CHECK-NEXT:      tile.barrier
// CHECK-NEXT:      tile.copy_async
// CHECK-NEXT:      tile.commit_group
// CHECK-NEXT:      %s = tile.ring_read
// CHECK-NEXT:      %x = tile.load %s
// CHECK-NEXT:      scf.yield
func.func @pipelined(%g: !tile.gl<?x?xbf16>, %n: i32, %c0: i32, %c1: i32) {
  %ring = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    tile.wait_group 1
    tile.copy_async %g[%j, %c0], %ring[%c0] : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
    tile.commit_group
    %s = tile.ring_read %ring[%c0] : !tile.ring<3, !tile.st<64x64xbf16>> -> !tile.st<64x64xbf16>
    %x = tile.load %s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
    scf.yield %x : !tile.rt<16x64xf32>
  }
  func.return
}

// A tile made in the loop with two buffers, taken in turn by the steps: a step's write goes to the buffer the step
// before did not touch, so only the read after the write needs a barrier (with one buffer, as @raw_war, the write
// also waits for the step before's reads).
// CHECK-LABEL: func.func @double_buffered(
// CHECK:         scf.for
// CHECK-NEXT:      %e = tile.empty {tkc.buffers = 2 : i64}
// CHECK-NEXT:      %s = tile.insert
// CHECK-NEXT:      tile.barrier
// CHECK-NEXT:      %x = tile.load %s
// CHECK-NOT:       tile.barrier
// CHECK:           scf.yield
func.func @double_buffered(%n: i32, %c0: i32, %c1: i32) {
  %z = tile.fill 0.0 : !tile.rt<16x64xf32>
  %r = scf.for %j = %c0 to %n step %c1 iter_args(%acc = %z) -> (!tile.rt<16x64xf32>) : i32 {
    %e = tile.empty {tkc.buffers = 2 : i64} : !tile.st<64x64xf32>
    %s = tile.insert %acc, %e[%c0, %c0] : !tile.rt<16x64xf32> -> !tile.st<64x64xf32>
    %x = tile.load %s[%c1, %c0] : !tile.st<64x64xf32> -> !tile.rt<16x64xf32>
    scf.yield %x : !tile.rt<16x64xf32>
  }
  func.return
}
