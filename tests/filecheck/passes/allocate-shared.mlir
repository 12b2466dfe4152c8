// RUN: tkc opt %s -p allocate-shared | filecheck %s

// Each allocating op gets its own buffer: swizzled tiles on 1024-byte boundaries, others on 128; rings take all
// their stages. The kernel's total goes on the function.

// CHECK-LABEL: func.func @buffers(
// CHECK-SAME:    tkc.smem_bytes = 25600
// CHECK:         tile.load %g[%i, %i] {tkc.smem_offset = 0 : i64} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
// CHECK:         tile.load %v[%i] {tkc.smem_offset = 8192 : i64} : !tile.gl<?xbf16> -> !tile.sv<64xbf16>
// CHECK:         tile.ring_alloc {tkc.smem_offset = 9216 : i64} : !tile.ring<2, !tile.st<64x64xbf16, swizzle 128>>
module attributes {tkc.target = "sm_80"} {
  func.func @buffers(%g: !tile.gl<?x?xbf16>, %v: !tile.gl<?xbf16>, %i: i32) {
    %a = tile.load %g[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
    %b = tile.load %v[%i] : !tile.gl<?xbf16> -> !tile.sv<64xbf16>
    %r = tile.ring_alloc : !tile.ring<2, !tile.st<64x64xbf16, swizzle 128>>
    func.return
  }
}
