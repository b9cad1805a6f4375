#!/usr/bin/env python3
# A lane-by-lane model of kernels/moe_gemv_mma.cu's index arithmetic (no
# GPU): the word transpose, the fp8 and mxfp4 A fragments, the staged x
# positions, the split warps and the epilogue's rows and tokens, run with
# the PTX ISA's mma.sync m16n8k16 fragment layout on exact values and
# checked against a direct dequantized product (fp8 block scales of several
# shapes, scale pairs, K tails, 1-17 tokens, passes). f16 rounding of x is
# not modelled (the kernel's staging is exact for the values tested).
#   python3 dev/cuda/moe_gemv_mma_model.py
# Written to check the kernel's layout before it met a GPU; rerun it after
# changing the layout (moe_gemv_layout.h holds the parts the kernel shares
# with its host test).
import math, random, struct, sys
random.seed(1)
def e4m3(b):
    s=-1 if b&0x80 else 1; e=(b>>3)&15; m=b&7
    if e==0: return s*m/8*2**-6
    return s*(1+m/8)*2**(e-7)
def e2m1(n):
    s=-1 if n&8 else 1; e=(n>>1)&3; m=n&1
    return s*(0.5*m if e==0 else (1+m/2)*2**(e-1))
# e2m1 -> e4m3 byte rewriting
def even(u): return (((u<<4)&0x80808080)|((u<<2)&0x1c1c1c1c))&0xffffffff
def odd(u): return ((u&0x80808080)|((u>>2)&0x1c1c1c1c))&0xffffffff
for n in range(16):
    lo=even(n)&0xff; hi=odd(n<<4)&0xff
    assert e4m3(lo)==e2m1(n)*2**-6, (n,lo); assert e4m3(hi)==e2m1(n)*2**-6
def words(bs): return [struct.unpack('<I',bytes(bs[4*i:4*i+4]))[0] for i in range(len(bs)//4)]
def transpose(W):  # W[lane][4] for 32 lanes
    W=[list(w) for w in W]
    for k in range(2):
        send=[(W[l][2*k] if l&1 else W[l][2*k+1]) for l in range(32)]
        for l in range(32):
            v=send[l^1]
            if l&1: W[l][2*k]=v
            else: W[l][2*k+1]=v
    for k in range(2):
        send=[(W[l][k] if l&2 else W[l][k+2]) for l in range(32)]
        for l in range(32):
            v=send[l^2]
            if l&2: W[l][k]=v
            else: W[l][k+2]=v
    return W
def cvt(two):  # e4m3x2 -> (lo, hi)
    return (e4m3(two&0xff), e4m3((two>>8)&0xff))
def mma(afr, bfr):
    A=[[None]*16 for _ in range(16)]; B=[[None]*8 for _ in range(16)]
    for l in range(32):
        g,t=l>>2,l&3; a=afr[l]; b=bfr[l]
        A[g][2*t],A[g][2*t+1]=a[0]; A[g+8][2*t],A[g+8][2*t+1]=a[1]
        A[g][2*t+8],A[g][2*t+9]=a[2]; A[g+8][2*t+8],A[g+8][2*t+9]=a[3]
        B[2*t][g],B[2*t+1][g]=b[0]; B[2*t+8][g],B[2*t+9][g]=b[1]
    return [[sum(A[i][k]*B[k][n] for k in range(16)) for n in range(8)] for i in range(16)]
def stagepos_mx(k):
    v=k&31; j=v&3
    return (k&~31)+16*((v>>2)&1)+4*(v>>3)+{1:2,2:1}.get(j,j)
# FP8 chunk
rows=[[random.randrange(256) for _ in range(64)] for _ in range(16)]
rows=[[c if (c&0x7f)!=0x7f else 0 for c in r] for r in rows]
x=[[random.uniform(-1,1) for _ in range(64)] for _ in range(8)]
W=[words(rows[l>>2][16*(l&3):16*(l&3)+16]) for l in range(32)]
H=[words(rows[(l>>2)+8][16*(l&3):16*(l&3)+16]) for l in range(32)]
W=transpose(W); H=transpose(H)
C=[[0]*8 for _ in range(16)]
for b in range(4):
    afr=[(cvt(W[l][b]),cvt(H[l][b]),cvt(W[l][b]>>16),cvt(H[l][b]>>16)) for l in range(32)]
    bfr=[]
    for l in range(32):
        g,t=l>>2,l&3; p=16*b+4*t
        bfr.append(((x[g][p],x[g][p+1]),(x[g][p+2],x[g][p+3])))
    c=mma(afr,bfr)
    for i in range(16):
        for n in range(8): C[i][n]+=c[i][n]
for i in range(16):
    for n in range(8):
        ref=sum(e4m3(rows[i][k])*x[n][k] for k in range(64))
        assert abs(ref-C[i][n])<1e-9*max(1,abs(ref)), (i,n,ref,C[i][n])
print("fp8 chunk ok")
# MXFP4 chunk: 16 rows x 64 bytes = 4 blocks of 32 values
rows=[[random.randrange(256) for _ in range(64)] for _ in range(16)]
def val(r,k): b=r[k//2]; return e2m1(b&15 if k%2==0 else b>>4)
x=[[random.uniform(-1,1) for _ in range(128)] for _ in range(8)]
xs=[[None]*128 for _ in range(8)]
for n in range(8):
    for k in range(128): xs[n][stagepos_mx(k)]=x[n][k]
W=transpose([words(rows[l>>2][16*(l&3):16*(l&3)+16]) for l in range(32)])
H=transpose([words(rows[(l>>2)+8][16*(l&3):16*(l&3)+16]) for l in range(32)])
C=[[0]*8 for _ in range(16)]
for b in range(4):
    a0=[];a1=[]
    for l in range(32):
        lg,hg,lh,hh=even(W[l][b]),odd(W[l][b]),even(H[l][b]),odd(H[l][b])
        a0.append((cvt(lg),cvt(lh),cvt(hg),cvt(hh))); a1.append((cvt(lg>>16),cvt(lh>>16),cvt(hg>>16),cvt(hh>>16)))
    for s,afr in ((0,a0),(1,a1)):
        bfr=[]
        for l in range(32):
            g,t=l>>2,l&3; p=32*b+4*t+16*s
            bfr.append(((xs[g][p],xs[g][p+1]),(xs[g][p+2],xs[g][p+3])))
        c=mma(afr,bfr)
        for i in range(16):
            for n in range(8): C[i][n]+=c[i][n]*64
for i in range(16):
    for n in range(8):
        ref=sum(val(rows[i],k)*x[n][k] for k in range(128))
        assert abs(ref-C[i][n])<1e-9*max(1,abs(ref)), (i,n,ref,C[i][n])
print("mxfp4 chunk ok")
def words(bs): return [struct.unpack('<I',bytes(bs[4*i:4*i+4]))[0] for i in range(4)]
def e8m0(e): return float('nan') if e==255 else 2.0**(e-127)
def mma_acc(C, afr, bfr):
    A=[[0]*16 for _ in range(16)]; B=[[0]*8 for _ in range(16)]
    for l in range(32):
        g,t=l>>2,l&3; a=afr[l]; b=bfr[l]
        A[g][2*t],A[g][2*t+1]=a[0]; A[g+8][2*t],A[g+8][2*t+1]=a[1]
        A[g][2*t+8],A[g][2*t+9]=a[2]; A[g+8][2*t+8],A[g+8][2*t+9]=a[3]
        B[2*t][g],B[2*t+1][g]=b[0]; B[2*t+8][g],B[2*t+9][g]=b[1]
    for l in range(32):
        g,t=l>>2,l&3
        for i in range(4):
            r=g+8*(i//2); n=2*t+(i%2)
            C[l][i]+=sum(A[r][k]*B[k][n] for k in range(16))
def split_rule(row_tiles, groups, chunks, sms=132):
    s=1
    while s<8 and chunks>=8*s and row_tiles*groups*s<sms*16: s*=2
    return s
def run(fmt, E, N, K, T, k, x, Wq, scales, exps, br, bc, pairs, bias, epi, P, order_div=None, groups=None):
    # groups: list of (e, row0, rows) tiles; x rows gathered via src(g)
    row_bytes = K if fmt=='fp8' else K//2
    chunks=(row_bytes+63)//64
    row_tiles=(N+15)//16
    split=split_rule(row_tiles, len(groups), chunks)
    tpb=8//split
    out={}
    ld=((K+ (64 if fmt=='fp8' else 128)-1)//(64 if fmt=='fp8' else 128))*(64 if fmt=='fp8' else 128)+16
    nkb=(K+bc-1)//bc
    inv=1.0/bc
    for (e,row0,trows) in groups:
        for bx in range((row_tiles+tpb-1)//tpb):
            c0=0
            while c0<trows:
                rows=min(P,trows-c0)
                xs=[[0.0]*ld for _ in range(rows)]
                for r in range(rows):
                    src=order_div(row0+c0+r)
                    for kk in range(K):
                        pos = kk if fmt=='fp8' else stagepos_mx(kk)
                        xs[r][pos]=x[src][kk]
                accs={}
                for warp in range(8):
                    part=warp%split
                    n0=(bx*tpb+warp//split)*16
                    mine=(chunks-part+split-1)//split if chunks>part else 0
                    acc=[[0.0]*4 for _ in range(32)]  # NT tiles flattened below
                    acc2=[[0.0]*4 for _ in range(32)]
                    def lane_rows(l):
                        g=l>>2; return [n0+g, n0+g+8]
                    def sbase(n):
                        if pairs:
                            hb=(N//2+br-1)//br; rb=e*2*hb+(n&1)*hb+(n>>1)//br
                        else:
                            rb=e*((N+br-1)//br)+n//br
                        return rb*nkb
                    for i in range(mine):
                        c=part+split*i
                        Wg=[];Wh=[];S=[];Ev=[]
                        for l in range(32):
                            t=l&3; off=c*64+16*t; ws=[]
                            for n in lane_rows(l):
                                if n<N and off<row_bytes: ws.append(words(Wq[e][n][off:off+16]))
                                else: ws.append([0,0,0,0])
                            Wg.append(ws[0]); Wh.append(ws[1])
                            if fmt=='fp8':
                                kb=(c*64)//bc
                                S.append([scales[sbase(n)+kb] if n<N else 0.0 for n in lane_rows(l)])
                            else:
                                blk=4*c+t; nb=K//32; ev=0
                                for q,n in enumerate(lane_rows(l)):
                                    if n<N and blk<nb: ev|=exps[e][n][blk]<<(8*q)
                                Ev.append(ev)
                        Wg=transpose(Wg); Wh=transpose(Wh)
                        for nt,A in ((0,acc),(1,acc2)):
                            if nt*8>=rows: continue
                            if fmt=='fp8':
                                step_scale = not (bc%64==0 or nkb==1)
                                tmp=[[0.0]*4 for _ in range(32)]
                                for b in range(4):
                                    k0=c*64+16*b
                                    if k0>=K: break
                                    afr=[(cvt(Wg[l][b]),cvt(Wh[l][b]),cvt(Wg[l][b]>>16),cvt(Wh[l][b]>>16)) for l in range(32)]
                                    bfr=[]
                                    for l in range(32):
                                        g,t=l>>2,l&3; tok=nt*8+g; p=k0+4*t
                                        bfr.append(((xs[tok][p],xs[tok][p+1]),(xs[tok][p+2],xs[tok][p+3])) if tok<rows else ((0,0),(0,0)))
                                    mma_acc(tmp,afr,bfr)
                                    if step_scale:
                                        kb=k0//bc
                                        for l in range(32):
                                            sc=[scales[sbase(n)+kb] if n<N else 0.0 for n in lane_rows(l)]
                                            for ii in range(4): A[l][ii]+=tmp[l][ii]*sc[ii//2]; tmp[l][ii]=0.0
                                if not step_scale:
                                    for l in range(32):
                                        for ii in range(4): A[l][ii]+=tmp[l][ii]*S[l][ii//2]
                            else:
                                nb=K//32
                                for b in range(4):
                                    blk=4*c+b
                                    if blk>=nb: break
                                    a=[[],[]]
                                    for l in range(32):
                                        eb=Ev[(l&~3)|b]
                                        for st in range(2):
                                            pg=[(even(Wg[l][b])>>(16*st))&0xffff,(odd(Wg[l][b])>>(16*st))&0xffff]
                                            ph=[(even(Wh[l][b])>>(16*st))&0xffff,(odd(Wh[l][b])>>(16*st))&0xffff]
                                            a[st].append((cvt(pg[0]),cvt(ph[0]),cvt(pg[1]),cvt(ph[1])))
                                    tmp=[[0.0]*4 for _ in range(32)]
                                    for st in range(2):
                                        bfr=[]
                                        for l in range(32):
                                            g,t=l>>2,l&3; tok=nt*8+g; p=blk*32+4*t+16*st
                                            bfr.append(((xs[tok][p],xs[tok][p+1]),(xs[tok][p+2],xs[tok][p+3])) if tok<rows else ((0,0),(0,0)))
                                        mma_acc(tmp,a[st],bfr)
                                    for l in range(32):
                                        eb=Ev[(l&~3)|b]; sc=[e8m0(eb&255),e8m0((eb>>8)&255)]
                                        for ii in range(4): A[l][ii]+=tmp[l][ii]*64*sc[ii//2]
                    accs[warp]=(acc,acc2)
                for warp in range(8):
                    if warp%split: continue
                    acc,acc2=[ [row[:] for row in a] for a in accs[warp]]
                    for w in range(1,split):
                        for l in range(32):
                            for ii in range(4):
                                acc[l][ii]+=accs[warp+w][0][l][ii]; acc2[l][ii]+=accs[warp+w][1][l][ii]
                    n0=(bx*tpb+warp//split)*16
                    for nt,A in ((0,acc),(1,acc2)):
                        for l in range(32):
                            g,t=l>>2,l&3
                            for ii in range(4):
                                n=n0+g+8*(ii//2); tok=nt*8+2*t+ii%2
                                if n<N and tok<rows:
                                    out[(row0+c0+tok,n)]=A[l][ii]+(bias[e][n] if bias else 0)
                c0+=P
    return out
random.seed(11)
def case(fmt, E, N, K, T, k, br=128, bc=128, pairs=False, P=16, dense=False):
    row_bytes = K if fmt=='fp8' else K//2
    Wq=[[[random.randrange(256) for _ in range(row_bytes)] for _ in range(N)] for _ in range(E)]
    if fmt=='fp8':
        for e in range(E):
            for n in range(N):
                Wq[e][n]=[c if (c&0x7f)!=0x7f else 0x3f for c in Wq[e][n]]
    nkb=(K+bc-1)//bc
    if pairs: nrb=2*((N//2+br-1)//br)
    else: nrb=(N+br-1)//br
    scales=[random.uniform(0.5,2)/64 for _ in range(E*nrb*nkb)]
    exps=[[[random.randrange(100,140) for _ in range(K//32)] for _ in range(N)] for _ in range(E)]
    bias=[[random.uniform(-1,1) for _ in range(N)] for _ in range(E)]
    x=[[random.uniform(-1,1)*(10**random.randrange(-3,3)) for _ in range(K)] for _ in range(T)]
    if dense:
        order=list(range(T)); groups=[]; 
        for r0 in range(0,T,64): groups.append((0,r0,min(64,T-r0)))
        div=lambda g: g
        A=T
    else:
        experts=[]
        for t in range(T):
            ids=list(range(E)); random.shuffle(ids)
            if t%2==0: ids.remove(0); ids.insert(0,0)
            experts+=ids[:k]
        A=T*k
        off=[0]*(E+1)
        for a in experts: off[a+1]+=1
        for e in range(E): off[e+1]+=off[e]
        order=[]
        for e in range(E): order+=[a for a in range(A) if experts[a]==e]
        groups=[]
        for e in range(E):
            for r0 in range(off[e],off[e+1],64): groups.append((e,r0,min(64,off[e+1]-r0)))
        div=lambda g: order[g]//k
    def sbase(e,n):
        if pairs:
            hb=(N//2+br-1)//br; rb=e*2*hb+(n&1)*hb+(n>>1)//br
        else: rb=e*((N+br-1)//br)+n//br
        return rb*nkb
    def W(e,n,kk):
        if fmt=='fp8': return e4m3(Wq[e][n][kk])*scales[sbase(e,n)+kk//bc]
        b=Wq[e][n][kk//2]; nib=b&15 if kk%2==0 else b>>4
        return e2m1(nib)*e8m0(exps[e][n][kk//32])
    out=run(fmt,E,N,K,T,k,x,Wq,scales,exps,br,bc,pairs,bias,None,P,div,groups)
    worst=0; cnt=0
    for (e,r0,rows) in groups:
        for g in range(r0,r0+rows):
            for n in range(N):
                ref=sum(x[div(g)][kk]*W(e,n,kk) for kk in range(K))+bias[e][n]
                got=out.get((g,n))
                assert got is not None, ('missing',g,n)
                worst=max(worst,abs(got-ref)/(abs(ref)+1e-6)); cnt+=1
    assert len(out)==cnt, (len(out),cnt)
    print(fmt,E,N,K,T,k,'br',br,'bc',bc,'pairs',pairs,'P',P,'dense',dense,'worst rel',worst)
    assert worst<1e-9
case('fp8',4,48,400,5,2,P=16)
case('fp8',4,40,208,6,2,br=16,bc=48,pairs=True,P=4)
case('fp8',2,32,160,9,1,br=16,bc=16,pairs=True,P=8)
case('fp8',1,32,256,3,1,br=1,bc=256,P=4,dense=True)
case('fp8',1,48,2048,2,1,br=1,bc=128,P=2,dense=True)
case('mx',4,32,96,5,2,P=8)
case('mx',2,48,288,17,1,P=16)
case('mx',1,16,2880,1,1,P=1,dense=True)
def byte_perm(a,b,s):
    bs=list(a.to_bytes(4,'little'))+list(b.to_bytes(4,'little'))
    return int.from_bytes(bytes(bs[(s>>(4*i))&7] for i in range(4)),'little')
for trial in range(100):
    vals=[random.randrange(65536) for _ in range(8)]  # x[k..k+7] bf16 bits
    v=[vals[0]|vals[1]<<16, vals[2]|vals[3]<<16, vals[4]|vals[5]<<16, vals[6]|vals[7]<<16]
    for t in range(4):
        k=8*t+32*2
        row={}
        at=stagepos_mx(k)
        w=[byte_perm(v[0],v[1],0x5410),byte_perm(v[0],v[1],0x7632)]
        w2=[byte_perm(v[2],v[3],0x5410),byte_perm(v[2],v[3],0x7632)]
        for i,word in enumerate(w): row[at+2*i]=word&0xffff; row[at+2*i+1]=word>>16
        for i,word in enumerate(w2): row[at+16+2*i]=word&0xffff; row[at+16+2*i+1]=word>>16
        for j in range(8):
            assert row[stagepos_mx(k+j)]==vals[j]
print('byte_perm staging ok')
