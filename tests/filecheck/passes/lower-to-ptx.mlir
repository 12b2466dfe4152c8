// RUN: tkc opt %s -p assign-layouts,assign-swizzles,allocate-shared,insert-barriers,lower-to-ptx | filecheck %s

// One ptx.kernel per function: the tensor becomes pointer, sizes and strides parameters; a 16x64 f32 exp2 is one
// ptx.op of 32 ex2 instructions; a 16x64 mma_ABt against a 64x64 B is one ptx.mma of 2 x 8 x 4 = 64 mma.sync.

// CHECK:       "ptx.kernel"() <{sym_name = "k", params = ["G_ptr:u64", "G_d0:s32", "G_d1:s32", "G_s0:s64", "G_s1:s64"]
// CHECK:         "ptx.mma"{{.*}}shape = "m16n8k16.row.col.f32.bf16.bf16.f32"
// CHECK:         "ptx.op"{{.*}}opcode = "ex2.approx.ftz.f32"{{.*}} -> !ptx.regs<b32, 32>
module attributes {tkc.target = "sm_80"} {
  func.func @k(%G: !tile.gl<?x?xbf16>) attributes {tkc.warps = 4 : i64} {
    %c0 = arith.constant 0 : i32
    %w = tile.warp_id
    %q = tile.load %G[%w, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<16x64xbf16>
    %k = tile.load %G[%c0, %c0] : !tile.gl<?x?xbf16> -> !tile.rt<64x64xbf16>
    %z = tile.fill 0.0 : !tile.rt<16x64xf32>
    %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
    %e = tile.exp2 %s : !tile.rt<16x64xf32>
    %b = tile.convert %e : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>
    tile.store %b, %G[%w, %c0] : !tile.rt<16x64xbf16> -> !tile.gl<?x?xbf16>
    func.return
  }
}
