// RUN: tkc opt %s -p cse | filecheck %s

// cse merges identical pure tile ops and loads of shared tiles (values), merges loads of global memory only while
// no store or barrier can have changed it, keeps fills of different values (0.0 and -0.0) apart, and drops
// unused pure ops.

// CHECK-LABEL: func.func @k(
// CHECK-NEXT:    %a = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    %c = tile.load %s[%i, %i] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    %e1 = tile.exp2 %a : !tile.rt<16x64xf32>
// CHECK-NEXT:    %s1 = tile.add %e1, %e1 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %s2 = tile.add %a, %c : !tile.rt<16x64xf32>
// CHECK-NEXT:    %s3 = tile.add %s2, %c : !tile.rt<16x64xf32>
// CHECK-NEXT:    %s4 = tile.add %s3, %s1 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %z1 = tile.fill 0.0 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %z3 = tile.fill -0.0 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %r = tile.add %z1, %z1 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %r2 = tile.add %r, %z3 : !tile.rt<16x64xf32>
// CHECK-NEXT:    %r3 = tile.add %r2, %s4 : !tile.rt<16x64xf32>
// CHECK-NEXT:    tile.store %r3, %g[%i, %i] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    tile.barrier
// CHECK-NEXT:    %a2 = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    tile.store %a2, %g[%i, %i] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    func.return
func.func @k(%g: !tile.gl<?x?xbf16>, %s: !tile.st<64x64xbf16>, %i: i32) {
  %a = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  %b = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  %c = tile.load %s[%i, %i] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
  %d = tile.load %s[%i, %i] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
  %e1 = tile.exp2 %a : !tile.rt<16x64xf32>
  %e2 = tile.exp2 %a : !tile.rt<16x64xf32>
  %s1 = tile.add %e1, %e2 : !tile.rt<16x64xf32>
  %s2 = tile.add %b, %c : !tile.rt<16x64xf32>
  %s3 = tile.add %s2, %d : !tile.rt<16x64xf32>
  %s4 = tile.add %s3, %s1 : !tile.rt<16x64xf32>
  %z1 = tile.fill 0.0 : !tile.rt<16x64xf32>
  %z2 = tile.fill 0.0 : !tile.rt<16x64xf32>
  %z3 = tile.fill -0.0 : !tile.rt<16x64xf32>
  %dead = tile.row_max %s4 : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  %r = tile.add %z1, %z2 : !tile.rt<16x64xf32>
  %r2 = tile.add %r, %z3 : !tile.rt<16x64xf32>
  %r3 = tile.add %r2, %s4 : !tile.rt<16x64xf32>
  tile.store %r3, %g[%i, %i] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  tile.barrier
  %a2 = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  tile.store %a2, %g[%i, %i] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  func.return
}
