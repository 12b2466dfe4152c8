// RUN: tkc opt %s -p canonicalize | filecheck %s

// canonicalize folds the arith index math and erases unused ops that only compute or read (a row_max, loads of
// shared and global memory); stores and barriers stay.
// The CHECK-NEXT chain shows that nothing else is left.

// CHECK-LABEL: func.func @k(
// CHECK-DAG:     %[[C2:.+]] = arith.constant 2 : i32
// CHECK-DAG:     %[[ROW:.+]] = arith.addi %w, %[[C2]] : i32
// CHECK:         %t = tile.load %g[%[[ROW]], %w] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
// CHECK-NEXT:    %e = tile.exp2 %t : !tile.rt<16x64xf32>
// CHECK-NEXT:    tile.barrier
// CHECK-NEXT:    tile.store %e, %g[%[[ROW]], %w] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
// CHECK-NEXT:    func.return
func.func @k(%g: !tile.gl<?x?xbf16>, %s: !tile.st<64x64xbf16>, %w: i32) {
  %c1 = arith.constant 1 : i32
  %one = arith.constant 1 : i32
  %c2 = arith.addi %c1, %one : i32
  %row = arith.addi %w, %c2 : i32
  %t = tile.load %g[%row, %w] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  %unused = tile.load %g[%w, %w] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xf32>
  %dead = tile.load %s[%w, %w] : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>
  %e = tile.exp2 %t : !tile.rt<16x64xf32>
  %m = tile.row_max %e : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
  tile.barrier
  tile.store %e, %g[%row, %w] : !tile.rt<16x64xf32> -> !tile.gl<?x?xbf16>
  func.return
}
