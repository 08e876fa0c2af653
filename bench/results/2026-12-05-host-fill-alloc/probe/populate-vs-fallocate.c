#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static char*base; static size_t total; static int nt; static int fd;
static void*work(void*a){long t=(long)a; size_t per=(total/nt+4095)/4096*4096; size_t s=t*per,e=s+per>total?total:s+per;
  if(getenv("FALLOC")){ if(fallocate(fd,0,s,e-s)) perror("fallocate"); }
  else if(madvise(base+s,e-s,MADV_POPULATE_WRITE)) perror("madvise"); return 0;}
int main(int c,char**v){total=(size_t)atol(v[1])<<20; nt=atoi(v[2]);
 double t0=now(); fd=memfd_create("p",0); ftruncate(fd,total); base=mmap(0,total,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);
 pthread_t th[64]; for(long i=0;i<nt;i++) pthread_create(&th[i],0,work,(void*)i); for(int i=0;i<nt;i++) pthread_join(th[i],0);
 double t1=now(); munmap(base,total); double t2=now(); printf("%s threads %d: populate %.3f munmap %.3f\n", getenv("FALLOC")?"fallocate":"MADV_POPULATE_WRITE", nt,t1-t0,t2-t1); return 0;}
