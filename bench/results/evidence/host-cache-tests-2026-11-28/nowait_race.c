#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <string.h>
#include <errno.h>
#include <time.h>
int main(int argc,char**argv){
  const char*path=argc>1?argv[1]:"/var/tmp/nwimg"; int n=argc>2?atoi(argv[2]):200; long len=64*4096;
  int fd=open(path,O_CREAT|O_RDWR|O_TRUNC,0600); char*buf=malloc(len); memset(buf,7,len); write(fd,buf,len); fsync(fd);
  unsigned char vec[64]; void*m=mmap(0,len,PROT_READ,MAP_SHARED,fd,0);
  int full=0,partial=0,zero=0;
  for(int i=0;i<n;i++){
    posix_fadvise(fd,0,0,POSIX_FADV_DONTNEED);
    mincore(m,len,vec); int r0=0; for(int j=0;j<64;j++) r0+=vec[j]&1;
    struct iovec iov={buf,len}; struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
    ssize_t r=preadv2(fd,&iov,1,0,RWF_NOWAIT); clock_gettime(CLOCK_MONOTONIC,&b);
    if(r<0) r=0;
    if(r==len) full++; else if(r>0) partial++; else zero++;
    if(r>0 && i<400) printf("i=%d resident_before=%d nowait=%zd took=%ld us\n",i,r0,r,(b.tv_nsec-a.tv_nsec)/1000+(b.tv_sec-a.tv_sec)*1000000);
  }
  printf("full=%d partial=%d zero=%d\n",full,partial,zero); unlink(path); return 0;}
